"""Workflow envs: train an existing multi-agent program, written as plain Python.

``workflow-example-v0``; :func:`make_workflow_env` for your own program.

| Property        | Value                                                                 |
|-----------------|-----------------------------------------------------------------------|
| API             | PettingZoo ``AECEnv`` (:class:`WorkflowEnv`)                          |
| Agents          | the program's roles (``roles=[...]``)                                 |
| Acting order    | the order of the program's ``team.call`` calls (D, recorded per episode) |
| Action space    | ``UnicodeText(max_action_chars)``: any string                         |
| Observation     | ``{"prompt": str, "turn": 0}``: the call's messages as text           |
| Reward          | the program's return value, as the shared team reward at the end       |
| Episode         | one run of the program on one problem; at most ``max_calls`` calls     |

The user writes the orchestration as a coroutine function::

    async def program(team, problem) -> float | dict[str, float]:
        draft = await team.call("solver", [{"role": "user", "content": problem.question}])
        review = await team.call("checker", [{"role": "user", "content": f"Check: {draft}"}])
        return team.grade(review).score

**Steps.** Each ``await team.call(role, messages, tools=None)`` is one AEC step of
``role``: the env suspends the program there (the coroutine is driven with
``send()``, no threads, no event loop), selects ``role``, and its observation is the
messages the program passed, exactly (``env.messages(role)``; ``observe(role)["prompt"]``
is the same as plain text; ``env.tools(role)`` the schemas given as ``tools=``). The
action (the model's text) is sent back into the program as the call's result. So the
order of the calls is the dependency function D of this episode: ``info["call_order"]``
records it, ``env.calls`` has every call (role, messages, tools, response).

**Reward.** When the program returns, its value is the team reward, given to every
role (PettingZoo semantics: ``last()`` returns it at the role's dead step). A number is
the ``program`` component; a dict of numbers is the components themselves (their sum is
the reward). ``team.grade(text)`` grades a text with the problem source's grader (a
:class:`~marft_envs.tasks.base.GradeResult`); the last grade made is ``info["grade"]``,
else ``correct`` is ``reward > 0``. Every call is one transition of its role with
``obs["turn"] == 0``: the whole episode is one graded turn, so the collector credits
the team reward to every call.

**A program that misbehaves never crashes the trainer.** It raises (any exception,
``SystemExit`` and ``GeneratorExit`` included; ``KeyboardInterrupt`` still stops the
process): the episode ends, reward 0, flag ``program_error``; ``info["error"]`` has the
exception and ``info["program_traceback"]`` its traceback (at most
:data:`MAX_TRACEBACK_CHARS` characters, head and tail kept). It calls an
unknown role or passes malformed messages: a ``WorkflowError`` is raised *inside the
program* at that call (it may catch it), the step is flagged ``unknown_role`` /
``bad_messages`` (the episode's final flags too) and ``info["rejected_calls"]`` keeps the
first messages. Messages over ``max_prompt_chars`` characters in all are rejected the same
way (flag ``messages_too_long``): ``env.messages(role)`` and ``observe`` stay within the
cap. It returns something that is not a number or a dict of finite numbers (or a number
too large for a float, ``10**400``): reward 0, flag ``bad_program_return``. It calls more
than ``max_calls`` times, rejected calls included (a program that retries a bad call in a
``try`` loop ends there): the program is closed, reward 0, the episode is truncated, flag
``max_calls_exceeded``. It awaits anything but ``team.call`` (``asyncio.sleep``):
flag ``foreign_await``, reward 0. It runs calls concurrently (``asyncio.gather`` or
``create_task`` of several ``team.call``): flag ``concurrent_calls``, reward 0, and
``info["error"]`` (logged once as a warning) says to await the calls one by one. It never calls a role: the episode is
over at ``reset()`` (every role dead, flag ``no_calls``, the reward is still its return
value). A program that loops forever *without* calling cannot be stopped from the same
thread: keep such work out of programs, or give it its own timeout.

**Determinism, pickling.** A program must be a function of the problem and the
responses it got (no hidden randomness: use ``team.rng``, seeded by ``reset``). A
pickled or copied env drops the suspended coroutine and replays the recorded responses
into a fresh one when restored; a program that asks for different calls on replay
raises ``RuntimeError`` there. Programs are pickled by reference (module-level
functions, or ``"module:function"`` strings).

Info keys at the end: ``turn`` (0), ``team_reward``, ``reward_components``,
``attribution`` (equal shares among the roles that were called), ``grade``, ``flags``,
``call_order``, ``calls_per_role``, ``num_calls``, ``problem_id``, ``error``
(None or what went wrong), ``program_traceback`` (None or the program's exception with
its traceback) and ``rejected_calls`` (the messages of rejected calls, at most 5).
``grade`` is the *last* ``team.grade`` the program made (else ``correct`` is
``reward > 0``): it is what an evaluation's accuracy counts. After each call: ``{"turn": 0, "flags", "call"}``
(the call's index).

Arguments of :func:`make_workflow_env`: ``program`` (a coroutine function or a
``"module:function"`` path), ``roles``, ``problems`` (a Task, a task name such as
``"arith"``, or a list of :class:`~marft_envs.tasks.base.Problem` / dicts / strings),
``sampling`` (per-role sampling settings, as in a profile), ``max_calls`` (32),
``max_action_chars`` (4096), ``max_prompt_chars`` (262144), ``render_mode``; other
keywords (``split``, ``digits``, ...) go to the task when ``problems`` names one (a
keyword that neither takes raises ``EnvArgumentError`` with the closest valid names).

Version history: v0: initial release.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import logging
import math
import numbers
import traceback
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from marft_envs.aec import TextAECEnv, check_problem_index, sanitize_action
from marft_envs.profiles import AgentProfile
from marft_envs.tasks import resolve_task_class
from marft_envs.tasks.base import GradeResult, Problem, Task
from marft_envs.topology import SeeAll, TopologyError, _unique

__all__ = [
    "MAX_TRACEBACK_CHARS",
    "ProblemList",
    "ProgramOrder",
    "WorkflowCall",
    "WorkflowEnv",
    "WorkflowError",
    "WorkflowTeam",
    "example_env",
    "example_program",
    "make_workflow_env",
]

logger = logging.getLogger("marft_envs")

Program = Callable[[Any, Problem], Awaitable[Any]]

#: What a program may raise and still only end its episode (reward 0, ``program_error``):
#: every exception, plus ``SystemExit`` and ``GeneratorExit``. ``KeyboardInterrupt`` still
#: stops the process (it is the user's Ctrl-C).
_PROGRAM_EXCEPTIONS: tuple[type[BaseException], ...] = (Exception, SystemExit, GeneratorExit)

#: The keyword arguments of :class:`WorkflowEnv` itself (for the did-you-mean of a typo).
_ENV_OPTIONS = ("sampling", "max_calls", "max_action_chars", "max_prompt_chars", "render_mode")


class WorkflowError(ValueError):
    """A bad ``team.call`` (unknown role, malformed messages): raised inside the program."""


@dataclass
class WorkflowCall:
    """One ``team.call``: who was asked, with what, and what it answered (None while pending)."""

    role: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    response: str | None = None


class _Request:
    """The awaitable behind ``team.call``: yields itself to the driver, returns the reply."""

    def __init__(self, role: Any, messages: Any, tools: Any):
        self.role, self.messages, self.tools = role, messages, tools
        self.awaited = False  # False for a call handed to asyncio.gather / create_task instead

    def __await__(self) -> Generator[_Request, Any, str]:
        self.awaited = True
        reply = yield self
        if isinstance(reply, BaseException):
            raise reply
        return reply


class ProblemList(Task):
    """A task over a fixed list of problems, graded by ``grader`` (default: exact match)."""

    name = "problems"

    def __init__(self, problems: Sequence[Problem | Mapping[str, Any] | str],
                 grader: Callable[[str, Problem], GradeResult] | None = None):
        items = []
        for k, p in enumerate(problems):
            if isinstance(p, Problem):
                items.append(p)
            elif isinstance(p, str):
                items.append(Problem(id=f"problem/{k}", question=p, answer=""))
            elif isinstance(p, Mapping) and "question" in p:
                items.append(Problem(id=str(p.get("id", f"problem/{k}")), question=str(p["question"]),
                                     answer=str(p.get("answer", "")), meta=dict(p.get("meta", {}))))
            else:
                raise TypeError(f"problem {k} must be a Problem, a question string or a dict with "
                                f"'question' (and 'answer', 'id', 'meta'), got {type(p).__name__}")
        if not items:
            raise ValueError("problems is empty: give at least one problem")
        self.problems = items
        self.grader = grader

    def __len__(self) -> int:
        return len(self.problems)

    def get(self, index: int) -> Problem:
        """Problem ``index``."""
        return self.problems[int(index)]

    def grade(self, response: str, problem: Problem) -> GradeResult:
        """``grader(response, problem)``, else exact match of the stripped texts."""
        if self.grader is not None:
            return self.grader(response, problem)
        ok = bool(problem.answer) and response.strip() == problem.answer.strip()
        return GradeResult(correct=ok, score=float(ok), extracted=response.strip()[:200], format_ok=True)


class ProgramOrder(SeeAll):
    """D of a workflow: decided by the program at run time (any call may see any earlier one).

    The acting order is the order of the calls (``info["call_order"]``); this object only
    describes the possible dependencies for the catalog and for code that asks a team."""

    def __init__(self, agents: Sequence[str]):
        self.agents = _unique(agents, "role")
        if not self.agents:
            raise TopologyError("a workflow needs at least one role")

    def next_agent(self, executed: Any) -> str | None:
        """Not known in advance: the program decides (read ``env.agent_selection``)."""
        raise TopologyError("a workflow's program decides who acts next; read env.agent_selection")

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "program", "agents": [...]}`` (not loadable: a program is code)."""
        return {"type": "program", "agents": list(self.agents)}

    def __repr__(self) -> str:
        return f"ProgramOrder({list(self.agents)})"


class WorkflowTeam:
    """What a program gets as ``team``: ``await team.call(role, messages, tools=None)``.

    Attributes:
        roles: the role names.
        profiles: ``{role: AgentProfile}`` (sampling settings for the collector).
        topology: :class:`ProgramOrder`.
        problem: the episode's problem (also the program's second argument).
        rng: a generator seeded by ``reset`` (for programs that need randomness).
    """

    def __init__(self, env: WorkflowEnv, roles: Sequence[str], sampling: Mapping[str, Any] | None = None):
        self._env = env
        self.roles = list(roles)
        sampling = dict(sampling or {})
        unknown = sorted(set(sampling) - set(self.roles))
        if unknown:
            raise ValueError(f"sampling names unknown roles {unknown}; roles are {self.roles}")
        self.profiles = {r: AgentProfile(role=r, prompt="", sampling=sampling.get(r) or {}) for r in self.roles}
        self.topology = ProgramOrder(self.roles)
        self.name = "workflow"

    @property
    def agents(self) -> list[str]:
        """The roles (as on a :class:`~marft_envs.profiles.Team`)."""
        return list(self.roles)

    @property
    def answer_agents(self) -> list[str]:
        """Every role: the program's score judges the whole run."""
        return list(self.roles)

    @property
    def problem(self) -> Problem | None:
        """The episode's problem."""
        return self._env.problem

    @property
    def rng(self) -> np.random.Generator:
        """The env's seeded generator."""
        return self._env.np_random

    def call(self, role: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> Any:
        """Ask ``role`` to reply to ``messages`` (chat messages); ``await`` it for the text.

        ``tools``: tool names, :class:`~marft_envs.tools.Tool` objects or schema dicts,
        shown to the collector as ``env.tools(role)``; the reply is returned as text and
        the program runs any tool call it asks for. Await each call before the next one
        (calls cannot run concurrently: ``asyncio.gather`` of calls ends the episode,
        flag ``concurrent_calls``)."""
        request = _Request(role, messages, tools)
        self._env._issued.append(request)
        return request

    def grade(self, response: str) -> GradeResult:
        """Grade ``response`` against the problem with the task's grader (never raises)."""
        return self._env._grade(response)

    def __repr__(self) -> str:
        return f"WorkflowTeam({self.roles})"


class _MessagesTooLong(WorkflowError):
    """The messages of one call exceed ``max_prompt_chars`` (flag ``messages_too_long``)."""


def _check_messages(messages: Any, max_chars: int) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]  # a bare prompt is one user message
    if not isinstance(messages, Sequence) or not messages:
        raise WorkflowError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, got {_safe_repr(messages, 80)}")
    total = -2
    for k, m in enumerate(messages):
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise WorkflowError(f"message {k} must be a dict with string 'role' and 'content', got {_safe_repr(m, 80)}")
        # The length of observe()'s text, "[role]: content" joined by blank lines: a call
        # within the cap is observed whole, and a million empty messages are over it too.
        total += len(m["role"]) + len(m["content"]) + 6
        if total > max_chars:  # checked before any copy: messages() and observe() stay within the cap
            raise _MessagesTooLong(
                f"team.call: the messages (from message {k} on) exceed max_prompt_chars={max_chars} characters "
                "as text: shorten them (keep only the history the role needs) or raise max_prompt_chars")
    return [copy.deepcopy(dict(m)) for m in messages]


def _tool_schemas(tools: Any) -> list[dict[str, Any]]:
    if not tools:
        return []
    from marft_envs.tools import resolve_tool

    out = []
    for t in tools:
        if isinstance(t, Mapping):
            out.append(copy.deepcopy(dict(t)))
        else:
            out.append(resolve_tool(t).schema())
    return out


def _check_task_options(where: str, task_cls: type | None, options: Mapping[str, Any]) -> None:
    """Raise a clear ``EnvArgumentError`` for a keyword that neither the workflow env nor
    its task takes (a typo such as ``max_call``), naming it and the closest valid names."""
    import difflib

    from marft_envs.registration import EnvArgumentError, accepted_arguments

    task_names = accepted_arguments(task_cls) if task_cls is not None else []
    if task_names is None:
        return  # the task takes **kwargs: it judges them itself
    unknown = [k for k in options if k not in task_names]
    if not unknown:
        return
    valid = [*_ENV_OPTIONS, *task_names]
    bad = unknown[0]
    close = difflib.get_close_matches(bad, valid, n=3, cutoff=0.6)
    msg = f"the workflow env has no option {bad!r}"
    if close:
        msg += f"; did you mean {' or '.join(map(repr, close))}?"
    if len(unknown) > 1:
        msg += f" (also unknown: {', '.join(map(repr, unknown[1:]))})"
    msg += f"; its options: {', '.join(_ENV_OPTIONS)}"
    msg += (f"; options of {where}: {', '.join(task_names) or '(none)'}" if task_cls is not None
            else f"; other keywords go to the task only when problems names one, not with {where}")
    raise EnvArgumentError(msg)


def _resolve_program(program: Program | str) -> Program:
    if isinstance(program, str):
        if ":" not in program:
            raise ValueError(f"program {program!r} must be a coroutine function or 'module:function'")
        module, attr = program.split(":", 1)
        program = getattr(importlib.import_module(module), attr)
    if not inspect.iscoroutinefunction(program):
        raise TypeError(f"program must be an 'async def program(team, problem)' function, got {program!r:.80}")
    return program  # type: ignore[return-value]


def _safe_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters; never raises (a program's return value
    may have a broken ``__repr__``, or be an int too long to print)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any object a program returns
        return f"<{type(value).__name__} with an unprintable repr>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_exception(e: BaseException) -> str:
    """``"Type: message"``; never raises (``str(e)`` may)."""
    try:
        return f"{type(e).__name__}: {e}"
    except Exception:  # noqa: BLE001 - an exception with a broken __str__
        return f"{type(e).__name__}: <unprintable message>"


#: Longest ``info["program_traceback"]`` kept (head and tail of longer ones).
MAX_TRACEBACK_CHARS = 4096


def _bounded_traceback(e: BaseException) -> str:
    """The program's traceback as text, at most :data:`MAX_TRACEBACK_CHARS` characters:
    the head (where the program was entered) and the tail (where it failed) of a long one."""
    tb = e.__traceback__
    if tb is not None and tb.tb_frame.f_code is WorkflowEnv._advance.__code__:
        tb = tb.tb_next  # drop the env's own frame: the traceback starts in the program
    try:
        text = "".join(traceback.format_exception(type(e), e, tb))
    except Exception:  # noqa: BLE001 - formatting must never fail the episode
        text = _describe_exception(e)
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    note = "\n  ... [{} characters cut] ...\n"
    head = 1024
    tail = MAX_TRACEBACK_CHARS - head - len(note.format(len(text)))
    return text[:head] + note.format(len(text) - head - tail) + text[-tail:]


def _real(v: Any) -> tuple[float | None, str]:
    """``float(v)`` of a finite real (bools excluded), else None and why."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        return None, f"{type(v).__name__} is not a number"
    try:
        f = float(v)
    except OverflowError:
        return None, f"{_safe_repr(v, 30)} overflows a float (OverflowError)"
    except Exception as e:  # noqa: BLE001 - a Real subclass with a broken __float__
        return None, f"float() of it raised {_describe_exception(e)}"
    if not math.isfinite(f):
        return None, f"{f} is not finite"
    return f, ""


def _reward_components(value: Any) -> tuple[dict[str, float] | None, str]:
    """The program's return value as reward components, or None and why it is not one."""
    if isinstance(value, (bool, np.bool_)):
        return {"program": float(value)}, ""
    if isinstance(value, numbers.Real):
        v, why = _real(value)
        return ({"program": v} if v is not None else None), why
    if isinstance(value, Mapping) and value:
        out = {}
        try:
            items = list(value.items())
        except Exception as e:  # noqa: BLE001 - a Mapping with a broken items()
            return None, f"its items() raised {_describe_exception(e)}"
        for k, v in items:
            if not isinstance(k, str):
                return None, f"key {_safe_repr(k, 30)} is not a str"
            f, why = _real(v)
            if f is None:
                return None, f"component {k[:40]!r}: {why}"
            out[k] = f
        return out, ""
    return None, "not a number or a non-empty dict of numbers"


class WorkflowEnv(TextAECEnv):
    """A multi-agent program run as an AEC env (see the module docstring)."""

    metadata = {"name": "workflow_v0", "render_modes": ["human", "ansi"], "is_parallelizable": False}

    def __init__(
        self,
        program: Program | str,
        roles: Sequence[str],
        problems: Task | str | Sequence[Any] = "arith",
        *,
        sampling: Mapping[str, Any] | None = None,
        max_calls: int = 32,
        max_action_chars: int = 4096,
        max_prompt_chars: int = 262_144,
        render_mode: str | None = None,
        **task_options: Any,
    ):
        super().__init__()
        self.program = _resolve_program(program)
        if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
            raise ValueError(f"max_calls must be an integer >= 1, got {max_calls!r}")
        self._check_render_mode(render_mode)
        if isinstance(problems, Task):
            if task_options:
                _check_task_options("a Task instance", None, task_options)
            self.task = problems
        elif isinstance(problems, str):
            task_cls = resolve_task_class(problems)
            _check_task_options(f"task {problems!r} ({task_cls.__name__})", task_cls, task_options)
            self.task = task_cls(**task_options)
        else:
            if task_options:
                _check_task_options("a problem list", None, task_options)
            self.task = ProblemList(problems)
        self.team = WorkflowTeam(self, roles, sampling)
        self.max_calls = int(max_calls)
        self.max_action_chars = int(max_action_chars)
        self.render_mode = render_mode
        self._init_spaces(self.team.roles, max_prompt_chars, 1)
        self.metadata = {**type(self).metadata, "name": f"workflow_{getattr(self.program, '__name__', 'program')}_v0"}
        self.stats: dict[str, int] = {"episodes": 0, "calls": 0, "program_errors": 0, "bad_calls": 0,
                                      "max_calls_exceeded": 0, "no_calls": 0}
        self.problem: Problem | None = None
        self.calls: list[WorkflowCall] = []
        self._coro: Any = None
        self._pending: WorkflowCall | None = None
        self._last_grade: GradeResult | None = None
        self._flags: list[str] = []
        self._step_flags: list[str] = []
        self._error: str | None = None
        self._traceback: str | None = None  # the program's exception, formatted (bounded)
        self._rejected = 0  # team.calls rejected this episode (unknown role, bad messages): they count too
        self._rejections: list[str] = []  # the first few rejection messages (info["rejected_calls"])
        self._rng_state: dict[str, Any] | None = None  # the generator at reset (replayed on restore)
        self._issued: list[_Request] = []  # every team.call of this episode, awaited or not
        self._warned_concurrent = False

    @property
    def num_problems(self) -> int:
        """Number of problems (``reset`` options may pick one)."""
        return len(self.task)

    @property
    def call_order(self) -> list[str]:
        """The roles called so far this episode, in order (D of this episode)."""
        return [c.role for c in self.calls]

    # ---------------------------------------------------------------- driving
    def _grade(self, response: Any) -> GradeResult:
        assert self.problem is not None
        text, _ = sanitize_action(response, self.max_action_chars)
        try:
            result = self.task.grade(text, self.problem)
            if not isinstance(result, GradeResult):
                raise TypeError(f"{type(self.task).__name__}.grade returned {type(result).__name__}")
        except Exception as e:  # a grader bug is a wrong answer here, flagged
            result = GradeResult(correct=False, error=f"{type(e).__name__}: {e}")
            self._flags.append("grade_error")
        self._last_grade = result
        return result

    def _advance(self, value: Any) -> None:
        """Send ``value`` into the program until it asks for a role or ends."""
        while True:
            try:
                request = self._coro.send(value)
            except StopIteration as stop:
                self._finish(stop.value)
                return
            except _PROGRAM_EXCEPTIONS as e:  # the program raised: end the episode, reward 0
                self._program_failed(e)
                if not self._concurrent_calls():
                    self._flags.append("program_error")
                    self.stats["program_errors"] += 1
                    logger.info("%s: the program raised %s", self, self._error)
                self._finish(None, failed=True)
                return
            if not isinstance(request, _Request):
                self._error = f"the program awaited {type(request).__name__}; only team.call can be awaited"
                if not self._concurrent_calls():
                    self._flags.append("foreign_await")
                self._close_program()
                self._finish(None, failed=True)
                return
            if len(self.calls) + self._rejected >= self.max_calls:
                self._error = f"more than max_calls={self.max_calls} calls"
                if self._rejected:
                    self._error += f" ({self._rejected} of them rejected: unknown role or bad messages)"
                self._flags.append("max_calls_exceeded")
                self.stats["max_calls_exceeded"] += 1
                self._close_program()
                self._finish(None, failed=True, truncated=True)
                return
            try:
                role = request.role
                # Compared as a plain str: a role object with its own __eq__/__hash__ never runs here.
                role = str.__str__(role) if isinstance(role, str) else None
                if role is None or role not in self.possible_agents:
                    self._step_flags.append("unknown_role")
                    raise WorkflowError(f"team.call: unknown role {_safe_repr(request.role)}; "
                                        f"roles are {self.possible_agents}")
                try:
                    messages = _check_messages(request.messages, self._max_prompt)
                    tools = _tool_schemas(request.tools)
                except _MessagesTooLong:
                    self._step_flags.append("messages_too_long")
                    raise
                except WorkflowError:
                    self._step_flags.append("bad_messages")
                    raise
                except Exception as e:
                    self._step_flags.append("bad_messages")
                    raise WorkflowError(f"team.call: bad messages or tools: {_describe_exception(e)}") from None
            except WorkflowError as e:
                self.stats["bad_calls"] += 1
                self._rejected += 1
                self._flags.append(self._step_flags[-1])  # the episode's final info says so too
                if len(self._rejections) < 5:
                    self._rejections.append(str(e)[:300])
                value = e  # raised inside the program at its call
                continue
            self._pending = WorkflowCall(role, messages, tools)
            self.calls.append(self._pending)
            self.agent_selection = role
            return

    def _program_failed(self, e: BaseException) -> None:
        """Record the program's exception: its text (``info["error"]``) and its bounded
        traceback (``info["program_traceback"]``)."""
        self._error = _describe_exception(e)
        self._traceback = _bounded_traceback(e)

    def _close_program(self) -> None:
        """Close the suspended program; one that ignores or answers the ``GeneratorExit``
        (a bare ``except:``) is dropped all the same."""
        coro, self._coro = self._coro, None
        if coro is None:
            return
        try:
            coro.close()
        except _PROGRAM_EXCEPTIONS as e:
            logger.info("%s: the program misbehaved on close: %s", self, _describe_exception(e))

    def _concurrent_calls(self) -> bool:
        """Whether the program failed because it ran ``team.call``s concurrently (calls it
        made but never awaited, e.g. through ``asyncio.gather``): flag it and say how to fix it."""
        pending = [r for r in self._issued if not r.awaited]
        if not pending:
            return False
        roles = ", ".join(repr(r.role)[:40] for r in pending)
        self._error = (
            f"the program issued {len(pending)} team.call(...) ({roles}) without awaiting each one "
            f"(asyncio.gather / create_task?): calls cannot run concurrently; write `reply = await "
            f"team.call(...)` for each call, one after another (their order is the dependency order). "
            f"Underlying error: {self._error}"
        )
        self._flags.append("concurrent_calls")
        self.stats["concurrent_calls"] = self.stats.get("concurrent_calls", 0) + 1
        if not self._warned_concurrent:
            self._warned_concurrent = True
            logger.warning("%s: %s", self, self._error)
        return True

    def _finish(self, value: Any, *, failed: bool = False, truncated: bool = False) -> None:
        self._coro = None
        self._pending = None
        try:
            components, why = (None, "") if failed else _reward_components(value)
        except Exception as e:  # noqa: BLE001 - e.g. a Mapping whose __len__ raises
            components, why = None, f"reading it raised {_describe_exception(e)}"
        if components is None:
            if not failed:
                self._error = (f"the program returned {type(value).__name__} {_safe_repr(value)}: {why}; "
                               "return a finite number or a dict of finite numbers")
                self._flags.append("bad_program_return")
            components = {"program": 0.0}
        team_reward = float(sum(components.values()))
        if not self.calls:
            self._flags.append("no_calls")
            self.stats["no_calls"] += 1
        called = list(dict.fromkeys(self.call_order))
        attribution = {a: (1.0 / len(called) if a in called else 0.0) for a in self.possible_agents}
        if not called:
            attribution = {a: 1.0 / len(self.possible_agents) for a in self.possible_agents}
        grade = self._last_grade
        if grade is None or failed:
            grade = GradeResult(correct=(not failed) and team_reward > 0, score=min(1.0, max(0.0, team_reward)))
        grade_info = asdict(grade)
        grade_info["details"] = {k: v for k, v in (grade_info.get("details") or {}).items()
                                 if k != "seconds" and not str(k).endswith("_seconds")}
        flags = list(dict.fromkeys(self._flags))
        for a in self.agents:
            self.rewards[a] = team_reward
            self.infos[a] = {
                "turn": 0,
                "team_reward": team_reward,
                "reward_components": dict(components),
                "attribution": dict(attribution),
                "grade": grade_info if a == self.agents[0] else copy.deepcopy(grade_info),
                "flags": list(dict.fromkeys(self._step_flags + flags)) if a == self.agent_selection else list(flags),
                "call_order": self.call_order,
                "calls_per_role": {r: self.call_order.count(r) for r in self.possible_agents},
                "num_calls": len(self.calls),
                "problem_id": self.problem.id if self.problem else None,
                "error": self._error,
                "program_traceback": self._traceback,
                "rejected_calls": list(self._rejections),
            }
        self._end_episode(truncated=truncated)

    def _start(self) -> None:
        """A fresh coroutine of the program on ``self.problem``, run to its first call."""
        self.calls = []
        self._issued = []
        self._pending = None
        self._last_grade = None
        self._flags, self._step_flags, self._error, self._traceback = [], [], None, None
        self._rejected, self._rejections = 0, []
        self._start_episode()
        self.agent_selection = self.agents[0]
        try:
            self._coro = self.program(self.team, self.problem)
        except _PROGRAM_EXCEPTIONS as e:
            self._program_failed(e)
            self._flags.append("program_error")
            self._finish(None, failed=True)
            return
        self._advance(None)
        if self._coro is not None and self._step_flags:  # a bad call before the first step is flagged too
            self.infos[self.agent_selection]["flags"] = list(dict.fromkeys(self._step_flags))

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Draw a problem (``seed``; ``options={"problem_index": k}`` picks one) and run the
        program to its first call."""
        self._close_program()
        self._seed(seed)
        options = dict(options or {})
        if "problem_index" in options:
            self.problem = self.task.get(check_problem_index(options["problem_index"], len(self.task)))
        else:
            self.problem = self.task.sample(self.np_random)
        self.stats["episodes"] += 1
        self._rng_state = copy.deepcopy(self.np_random.bit_generator.state)
        self._start()
        self._end_step()

    # ------------------------------------------------------------------ views
    def _is_reset(self) -> bool:
        """Whether ``reset()`` drew a problem."""
        return self.problem is not None

    def _call_for(self, agent: str) -> WorkflowCall | None:
        if self._pending is not None and self._pending.role == agent:
            return self._pending
        for c in reversed(self.calls):
            if c.role == agent:
                return c
        return None

    def messages(self, agent: str) -> list[dict[str, Any]]:
        """The messages of ``agent``'s pending (else latest) call, exactly as the program
        passed them; before its first call, the problem as one user message."""
        self._require_reset("messages()")
        call = self._call_for(agent)
        if call is None:
            return [{"role": "user", "content": self.problem.question}]  # type: ignore[union-attr]
        return copy.deepcopy(call.messages)

    def tools(self, agent: str) -> list[dict[str, Any]]:
        """The tool schemas of ``agent``'s pending (else latest) call (``[]`` without tools)."""
        call = self._call_for(agent)
        return copy.deepcopy(call.tools) if call is not None else []

    def observe(self, agent: str) -> dict[str, Any]:
        """``{"prompt": the messages as text, "turn": 0}``."""
        msgs = self.messages(agent)
        prompt = "\n\n".join(f"[{m['role']}]: {m['content']}" for m in msgs)
        return {"prompt": prompt[: self._max_prompt], "turn": 0}

    # ------------------------------------------------------------------- step
    def _act(self, agent: str, text: str, flags: list[str]) -> None:
        """Answer the pending call of ``agent`` with ``text`` and run the program to its
        next call (or its end)."""
        self._step_flags = list(flags)
        assert self._pending is not None and self._pending.role == agent
        self._pending.response = text
        index = len(self.calls) - 1
        self.stats["calls"] += 1
        self._pending = None
        self._advance(text)
        if agent in self.infos and not (self.terminations[agent] or self.truncations[agent]):
            self.infos[agent] = {"turn": 0, "flags": list(self._step_flags), "call": index}
        elif agent in self.infos:
            self.infos[agent]["call"] = index

    # ------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        # A suspended coroutine cannot be pickled: keep the responses and replay them.
        # The program itself is pickled by reference (a module-level function).
        state = self.__dict__.copy()
        state["_coro"] = None
        state["_issued"] = []  # the replay issues the calls again
        state["_replay"] = self._coro is not None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        replay = state.pop("_replay", False)
        self.__dict__.update(state)
        if replay:
            self._replay()

    def _replay(self) -> None:
        """Rebuild the suspended program by feeding it the recorded responses again."""
        recorded = self.calls
        snapshot = (self.infos, self.rewards, self._cumulative_rewards, self.agent_selection,
                    self._step_flags, dict(self.stats), self.np_random.bit_generator.state)
        self.np_random.bit_generator.state = copy.deepcopy(self._rng_state)
        self._start()
        for k, old in enumerate(recorded):
            new = self._pending
            if new is None or new.role != old.role or new.messages != old.messages:
                raise RuntimeError(f"the program is not deterministic: on replay, call {k} differs from the "
                                   "recorded one; derive randomness from team.rng and the problem only")
            if old.response is None:
                break
            new.response = old.response
            self._pending = None
            self._advance(old.response)
        (self.infos, self.rewards, self._cumulative_rewards, self.agent_selection,
         self._step_flags, self.stats, rng_state) = snapshot
        self.np_random.bit_generator.state = rng_state

    # ----------------------------------------------------------------- render
    def _render_text(self) -> str:
        """The problem and the calls so far (each call's last message and its reply)."""
        lines = [f"== {self.problem.id} =="]  # type: ignore[union-attr]
        for c in self.calls:
            lines.append(f"[{c.role}] <- {c.messages[-1]['content'][:200]!r}")
            lines.append(f"[{c.role}] -> {c.response!r:.200}")
        return "\n".join(lines)

    def close(self) -> None:
        """Close a suspended program."""
        self._close_program()

    def __repr__(self) -> str:
        return f"WorkflowEnv({getattr(self.program, '__name__', 'program')}, roles={self.possible_agents})"


def make_workflow_env(program: Program | str, roles: Sequence[str], problems: Task | str | Sequence[Any] = "arith",
                      **kwargs: Any) -> WorkflowEnv:
    """A :class:`WorkflowEnv` running ``program`` with ``roles`` on ``problems`` (see the module docstring)."""
    return WorkflowEnv(program, roles, problems, **kwargs)


# ------------------------------------------------------------------ the example program
_SOLVE = "Solve the problem. Give the final answer as a number inside \\boxed{}."
_CHECK = ("Check the solution. If it is wrong, write REVISE and say why. "
          "Then give the final answer as a number inside \\boxed{}.")


async def example_program(team: WorkflowTeam, problem: Problem) -> dict[str, float]:
    """solver -> checker; if the checker writes ``REVISE``, the solver tries once more and
    the checker has the last word. Reward: the checker's final answer, graded."""
    draft = await team.call("solver", [{"role": "system", "content": _SOLVE},
                                       {"role": "user", "content": problem.question}])
    review = await team.call("checker", [{"role": "system", "content": _CHECK},
                                         {"role": "user", "content": f"{problem.question}\nSolution: {draft}"}])
    if "REVISE" in review:
        draft = await team.call("solver", [{"role": "system", "content": _SOLVE},
                                           {"role": "user", "content": f"{problem.question}\nCritique: {review}"}])
        review = await team.call("checker", [{"role": "system", "content": _CHECK},
                                             {"role": "user", "content": f"{problem.question}\nSolution: {draft}"}])
    return {"outcome": float(team.grade(review).correct)}


def example_env(problems: Task | str | Sequence[Any] = "arith", **kwargs: Any) -> WorkflowEnv:
    """``workflow-example-v0``: :func:`example_program` (solver, checker) on arith problems
    (``split``, ``digits``, ... go to the task; ``problems=`` replaces them)."""
    if problems == "arith":
        kwargs.setdefault("split", "train")
    return WorkflowEnv("marft_envs.workflow:example_program", ["solver", "checker"], problems, **kwargs)
