"""Program envs: train an unmodified program that calls an OpenAI-compatible endpoint.

| Property        | Value                                                                  |
|-----------------|------------------------------------------------------------------------|
| API             | PettingZoo ``AECEnv`` (:class:`ProgramEnv`, a :class:`WorkflowEnv`)    |
| Agents          | the roles (the ``model`` names the program asks for)                   |
| Acting order    | the order the program's calls are answered (``info["call_order"]``)    |
| Action space    | ``UnicodeText(max_action_chars)``: any string                          |
| Observation     | ``{"prompt": str, "turn": 0}``: the call's messages as text            |
| Reward          | the program's return (number, dict, or answer graded by the task)      |
| Episode         | one run of ``program(base_url, problem)`` in a worker thread           |

The user's program is whatever they already run, pointed at ``base_url``::

    def program(base_url: str, problem) -> float | dict | str:
        llm = ChatOpenAI(model="solver", base_url=base_url, api_key="unused")
        return llm.invoke(problem.question).content      # graded by the task's grader

``async def`` programs work the same: they run on one event loop shared by all episodes
(in its own thread), so that clients that cache connections per loop keep working.
Each episode gets its own ``base_url`` (``http://127.0.0.1:PORT/episodes/<id>/v1``, a
random 128-bit id): one episode cannot see or answer another's calls. The server is one
loopback uvicorn thread per process (:mod:`marft_algos.serve`), shared by all envs.

**Steps.** Every chat-completion request of the program is one AEC step of its role
(``model``). Requests wait at the server; the oldest one that is not answered is the
agent selection, its messages are ``env.messages(role)`` (tool schemas in
``env.tools(role)``), and ``step(text)`` answers it (tool calls in the text are parsed
into ``tool_calls`` by the ``hermes`` parser, or ``parser=``). Parallel calls (a
LangGraph fan-out, ``asyncio.gather``) are pending together and answered one at a time;
the collector may answer the pending calls of many envs in one engine batch. Sampling
settings in the request are not used for training: the trainer samples with the role's
settings (``sampling=``). ``info["call_edges"]`` lists ``(earlier, later)`` call indices
where the later call's messages contain the earlier call's reply.

**Reward posted by the program.** ``POST {base_url}/reward`` with
``{"components": {"judge": 0.7}}`` adds reward components to the episode (e.g. from a
judge the program runs). They count when they arrive before the program returns, or
within ``reward_grace_s`` after it (the env waits that long for a first post). They are
merged over the returned components, and a program that returns None gets only them.
A post after the episode ended gets a 409.

**Faults.** The program raises (``program_error``), does not call or return within
``program_timeout_s`` of its last answer (``program_timeout``), calls an unknown role
(``unknown_role``; the program gets a 404), makes more than ``max_calls`` calls
(``max_calls_exceeded``, truncated; further calls get a 409), or returns something that
is not a finite number, a dict of them, or a string (``bad_program_return``): the
episode ends with reward 0 and the flag. A call into an ended episode gets a 409. A
thread that never returns cannot be killed: it is left behind (a daemon thread) and its
later calls are refused.

**Pickling.** A copy restarts the program and replays the recorded replies (matched by
role and messages), like :class:`~marft_envs.workflow.WorkflowEnv`; the program must
be deterministic given the problem and the replies.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from marft_envs.registration import register, registry
from marft_envs.tasks.base import Task
from marft_envs.tools.parsers import get_parser
from marft_envs.workflow import WorkflowCall, WorkflowEnv
from marft_envs.workflow import _reward_components as _components_and_why


def _reward_components(value: Any) -> dict[str, float] | None:
    """``value`` as reward components, or None (the workflow env's reader, without its reason)."""
    return _components_and_why(value)[0]


__all__ = ["ProgramCall", "ProgramEnv", "example_program", "make_program_env"]


@dataclass
class ProgramCall(WorkflowCall):
    """One request of the program: role, messages, tools, the reply (None while pending)."""

    index: int = 0
    answers_before: int = 0  # replies given in the episode when this call arrived
    arrived: float = 0.0  # time.monotonic() when the request reached the server (latency in info)
    future: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "future": None}  # a pending HTTP request does not survive a copy


class _Episode:
    """The server side of one episode: its pending calls and the program's outcome."""

    def __init__(self, env: ProgramEnv) -> None:
        self.id = uuid.uuid4().hex
        self.env = env
        self.roles = list(env.possible_agents)
        self.cond = threading.Condition()
        self.pending: list[ProgramCall] = []
        self.done = False
        self.value: Any = None
        self.error: str | None = None
        self.fatal: str | None = None  # a flag that ends the episode (unknown_role, max_calls_exceeded)
        self.ended = False
        self.replay: list[ProgramCall] | None = None  # recorded calls to answer again (after a copy)
        self.replay_error: str | None = None
        self.task: Future | None = None  # an async program's run on the program loop
        self.posted: dict[str, float] = {}  # reward components posted to .../reward
        self.last_arrival = 0.0  # time.monotonic() of the latest call (the fan-out window counts from it)


class _Hub:
    """The process-wide server of every program episode (started on first use)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.episodes: dict[str, _Episode] = {}
        self.server: Any = None

    def url(self, ep: _Episode) -> str:
        with self.lock:
            if self.server is None:
                # deferred: import marft_envs loads no marft_algos (torch); the server side loads when a program runs
                from marft_algos.serve.app import build_app
                from marft_algos.serve.server import LoopbackServer

                app = build_app(None, self.dispatch, roles_of=self.roles_of, on_refused=self.refused, episodes=True,
                                on_reward=self.reward)
                self.server = LoopbackServer(app).start()
            self.episodes[ep.id] = ep
        return f"{self.server.url}/episodes/{ep.id}/v1"

    def drop(self, ep: _Episode) -> None:
        with self.lock:
            self.episodes.pop(ep.id, None)

    def _episode(self, episode: str | None) -> _Episode:
        # deferred: import marft_envs loads no marft_algos (torch); the server side loads when a program runs
        from marft_algos.serve.protocol import OpenAIError

        ep = self.episodes.get(episode or "")
        if ep is None:
            raise OpenAIError(404, "unknown episode: use the base_url your program was given", code="episode_not_found")
        return ep

    def roles_of(self, episode: str | None) -> list[str]:
        return self._episode(episode).roles

    def refused(self, episode: str | None, err: Any) -> None:
        ep = self.episodes.get(episode or "")
        if ep is not None and err.code == "model_not_found":
            with ep.cond:
                ep.fatal = ep.fatal or "unknown_role"
                ep.error = err.message
                ep.cond.notify_all()

    def reward(self, episode: str, body: Any) -> dict[str, Any]:
        """``POST .../reward {"components": {name: number}}``: reward components for the episode."""
        # deferred: import marft_envs loads no marft_algos (torch); the server side loads when a program runs
        from marft_algos.serve.protocol import OpenAIError

        ep = self._episode(episode)
        parts = body.get("components") if isinstance(body, Mapping) else None
        comps = _reward_components(parts) if isinstance(parts, Mapping) else None
        if comps is None:
            raise OpenAIError(400, 'the body must be {"components": {name: finite number, ...}}', param="components")
        with ep.cond:
            if ep.ended:
                raise OpenAIError(409, "this episode has ended; its reward is final", code="episode_ended")
            ep.posted.update(comps)
            ep.cond.notify_all()
        return {"episode": episode, "components": dict(ep.posted)}

    def dispatch(self, episode: str | None, call: Any) -> Future:
        ep = self._episode(episode)
        return ep.env._on_call(ep, call)


_HUB = _Hub()


def _resolve(program: Any) -> Callable[..., Any]:
    if isinstance(program, str):
        if ":" not in program:
            raise ValueError(f"program {program!r} must be a function or 'module:function'")
        module, attr = program.split(":", 1)
        program = getattr(importlib.import_module(module), attr)
    if not callable(program):
        raise TypeError(f"program must be a function program(base_url, problem), got {program!r:.80}")
    return program


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _program_loop() -> asyncio.AbstractEventLoop:
    """The one event loop (in its own thread) that runs every ``async def`` program.

    Not ``asyncio.run`` per episode: clients cache connections per loop
    (``langchain-openai`` keeps one ``httpx.AsyncClient`` per process), and a loop closed
    after one episode would break the next episode's calls ("Event loop is closed").
    """
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="marft-program-loop", daemon=True).start()
            _LOOP = loop
        return _LOOP


def _run_program(program: Callable[..., Any], base_url: str, problem: Any, ep: _Episode) -> None:
    """The worker thread: run the program, keep its outcome, wake the env."""
    value, error = None, None
    try:
        value = program(base_url, problem)
        if inspect.isawaitable(value):
            task = asyncio.run_coroutine_threadsafe(_awaited(value), _program_loop())
            with ep.cond:
                ep.task = task
            value = task.result()
    except BaseException as e:  # noqa: BLE001 (a program's failure is an outcome, reported in info)
        error = f"{type(e).__name__}: {e}"
    with ep.cond:
        ep.done, ep.value, ep.error = True, value, ep.error or error
        ep.cond.notify_all()


async def _awaited(aw: Any) -> Any:
    return await aw


async def _placeholder(team: Any, problem: Any) -> None:
    """Stands in for WorkflowEnv's coroutine program (a ProgramEnv drives a thread instead)."""


def _seconds(name: str, value: float, *, zero_ok: bool = True) -> float:
    """``value`` as float seconds; a clear error when it is negative (or 0 where not ``zero_ok``)."""
    if not (value >= 0 if zero_ok else value > 0):  # `not` so that NaN fails too
        raise ValueError(f"{name} must be {'>=' if zero_ok else '>'} 0, got {value!r}")
    return float(value)


class ProgramEnv(WorkflowEnv):
    """A program that calls an OpenAI-compatible endpoint, run as an AEC env (module docstring).

    Args:
        program: ``program(base_url, problem)`` (sync or ``async def``) or ``"module:function"``.
        roles: the role names (the ``model`` values the program may use).
        problems: a Task, a task name (``"arith"``) or a list of problems (as :class:`WorkflowEnv`).
        program_timeout_s: longest wait for the program's next call or return.
        reward_grace_s: after the program returns, how long to wait for reward components
            posted to ``{base_url}/reward`` (0: only those posted before it returned).
        parser: the tool-call parser that turns replies into ``tool_calls``.
        fanout_window_s: after a call arrives, wait until no other call arrived for this
            long before selecting it, so that the sibling requests of a fan-out are all
            :meth:`pending_calls` together (the collector answers them in one engine batch);
            0 selects at once (a sequential program then loses nothing).
        options: :class:`WorkflowEnv`'s keyword arguments (``sampling``: per-role sampling
            settings for the trainer, ``max_calls``: call budget per episode,
            ``max_action_chars``, ``max_prompt_chars``, ``render_mode``) and the task's options.
    """

    metadata = {"name": "program_v0", "render_modes": ["human", "ansi"], "is_parallelizable": False}

    def __init__(
        self,
        program: Callable[..., Any] | str,
        roles: Sequence[str],
        problems: Task | str | Sequence[Any] = "arith",
        *,
        program_timeout_s: float = 120.0,
        reward_grace_s: float = 0.0,
        parser: str = "hermes",
        fanout_window_s: float = 0.02,
        **options: Any,
    ) -> None:
        super().__init__(_placeholder, roles, problems, **options)
        self.program = _resolve(program)
        self.program_timeout_s = _seconds("program_timeout_s", program_timeout_s, zero_ok=False)
        self.reward_grace_s = _seconds("reward_grace_s", reward_grace_s)
        self.parser = parser
        self.fanout_window_s = _seconds("fanout_window_s", fanout_window_s)
        self.metadata = {**type(self).metadata, "name": f"program_{getattr(self.program, '__name__', 'program')}_v0"}
        self.stats.update({"program_timeouts": 0, "unknown_roles": 0})
        self._ep: _Episode | None = None
        self._answered: list[int] = []
        self.last_trace: dict[str, Any] = {}  # the latest answered call: role, index, episode id, latency

    # ------------------------------------------------------------ the server side
    def _on_call(self, ep: _Episode, call: Any) -> Future:
        """A request of episode ``ep``'s program (server thread): queue it, or refuse it."""
        # deferred: import marft_envs loads no marft_algos (torch); the server side loads when a program runs
        from marft_algos.models.sampling import GenResult
        from marft_algos.serve.protocol import OpenAIError

        fut: Future = Future()
        with ep.cond:
            if ep.ended or ep.fatal or ep is not self._ep:  # a call of an earlier episode of this env
                raise OpenAIError(409, "this episode has ended; its calls are no longer answered", code="episode_ended")
            if ep.replay:  # a restored copy: answer the recorded calls again (then new calls are new)
                match = next((c for c in ep.replay if c.role == call.role and c.messages == call.messages), None)
                if match is None:
                    ep.replay_error = f"call to {call.role!r} was not recorded"
                    ep.cond.notify_all()
                    raise OpenAIError(409, "replay diverged: the program is not deterministic", code="episode_ended")
                ep.replay.remove(match)
                if match.response is not None:
                    fut.set_result([GenResult([], match.response, [], "eos")])
                else:
                    match.future = fut
                    ep.pending.append(match)
                    ep.last_arrival = time.monotonic()
                ep.cond.notify_all()
                return fut
            if len(self.calls) >= self.max_calls:
                ep.fatal = "max_calls_exceeded"
                ep.error = f"more than max_calls={self.max_calls} calls"
                ep.cond.notify_all()
                raise OpenAIError(409, f"the call budget of this episode ({self.max_calls}) is spent", code="episode_ended")
            rec = ProgramCall(call.role, [dict(m) for m in call.messages], [dict(t) for t in call.tools],
                              index=len(self.calls), answers_before=len(self._answered), future=fut,
                              arrived=time.monotonic())
            self.calls.append(rec)
            ep.pending.append(rec)
            ep.last_arrival = rec.arrived
            ep.cond.notify_all()
        return fut

    # ------------------------------------------------------------- driving
    def _launch(self) -> _Episode:
        ep = _Episode(self)
        self._ep = ep
        url = _HUB.url(ep)
        threading.Thread(target=_run_program, args=(self.program, url, self.problem, ep),
                         name=f"marft-program-{ep.id[:8]}", daemon=True).start()
        return ep

    def _end_program(self) -> None:
        """Refuse the episode's further calls and fail its waiting ones."""
        ep, self._ep = self._ep, None
        if ep is None:
            return
        # deferred: import marft_envs loads no marft_algos (torch); the server side loads when a program runs
        from marft_algos.serve.protocol import OpenAIError

        with ep.cond:
            ep.ended = True
            for c in [*ep.pending, *([self._pending] if self._pending is not None else [])]:
                if c.future is not None and not c.future.done():
                    c.future.set_exception(OpenAIError(409, "this episode has ended", code="episode_ended"))
            ep.pending.clear()
            if ep.task is not None and not ep.task.done():
                ep.task.cancel()  # an async program still running (timed out, cut off) stops here
        _HUB.drop(ep)

    def _wait(self) -> str:
        """Wait for the program's next call or its end: ``"call"``, ``"done"``, ``"fatal"`` or ``"timeout"``."""
        ep = self._ep
        assert ep is not None
        deadline = time.monotonic() + self.program_timeout_s
        with ep.cond:
            while True:
                if ep.fatal:
                    return "fatal"
                if ep.pending:
                    # a fan-out's sibling requests arrive a few ms apart: wait until none came
                    # for fanout_window_s, so that they are pending together (one engine batch)
                    quiet = ep.last_arrival + self.fanout_window_s - time.monotonic()
                    if quiet <= 0 or ep.done:
                        return "call"
                    ep.cond.wait(quiet)
                    continue
                if ep.done:
                    return "done"
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                ep.cond.wait(left)

    def _select(self) -> None:
        """Make the oldest pending call the agent selection, or end the episode."""
        ep = self._ep
        what = self._wait()
        if what == "call":
            with ep.cond:
                self._pending = ep.pending.pop(0)
            self.agent_selection = self._pending.role
            return
        if what == "timeout":
            self._error = f"the program neither called nor returned within {self.program_timeout_s} s"
            self._flags.append("program_timeout")
            self.stats["program_timeouts"] += 1
            self._stop(None, failed=True)
        elif what == "fatal":
            self._error = ep.error
            self._flags.append(ep.fatal)
            if ep.fatal == "unknown_role":
                self.stats["unknown_roles"] += 1
            else:
                self.stats["max_calls_exceeded"] += 1
            self._stop(None, failed=True, truncated=ep.fatal == "max_calls_exceeded")
        elif ep.error is not None:
            self._error = ep.error
            self._flags.append("program_error")
            self.stats["program_errors"] += 1
            self._stop(None, failed=True)
        else:
            if self.reward_grace_s > 0:  # a judge the program started may still post components
                deadline = time.monotonic() + self.reward_grace_s
                with ep.cond:
                    while not ep.posted and time.monotonic() < deadline:
                        ep.cond.wait(max(0.0, deadline - time.monotonic()))
            self._stop(ep.value)

    def _stop(self, value: Any, *, failed: bool = False, truncated: bool = False) -> None:
        posted = dict(self._ep.posted) if self._ep is not None else {}
        self._end_program()
        if not failed and isinstance(value, str):  # a final answer: the task grades it
            value = {"outcome": float(self._grade(value).score)}
        elif not failed and value is None and posted:  # the reward is what was posted
            value = {}
        elif not failed and _reward_components(value) is None:
            self._error = f"the program returned {type(value).__name__} {value!r:.60}, not a finite number, a dict of them or a string"
            self._flags.append("bad_program_return")
            failed = True
        if not failed and posted:
            value = {**(_reward_components(value) or {}), **posted}
        self._finish(value, failed=failed, truncated=truncated)
        for info in self.infos.values():
            info["call_edges"] = self._edges()

    def _edges(self) -> list[tuple[int, int]]:
        """``(earlier, later)``: the later call arrived after the earlier one was answered
        and its messages contain that reply (the text, stripped)."""
        edges = []
        for later in self.calls:
            text = "\n".join(str(m.get("content", "")) for m in later.messages)
            for earlier in (self.calls[i] for i in self._answered[: later.answers_before]):
                reply = (earlier.response or "").strip()
                if reply and reply in text:
                    edges.append((earlier.index, later.index))
        return edges

    @property
    def call_order(self) -> list[str]:
        """The roles of the calls in the order they were answered (D of this episode)."""
        return [self.calls[i].role for i in self._answered]

    def _start(self) -> None:
        """Start the program on ``self.problem`` and wait for its first call."""
        self._end_program()
        self.calls, self._answered = [], []
        self._pending, self._last_grade = None, None
        self._flags, self._step_flags, self._error = [], [], None
        self._start_episode()
        self.agent_selection = self.agents[0]
        self._launch()
        self._select()

    def _act(self, agent: str, text: str, flags: list[str]) -> None:
        """Answer the selected call with ``text``; wait for the next call (or the end)."""
        # deferred: import marft_envs loads no marft_algos (torch); the server side loads when a program runs
        from marft_algos.models.sampling import GenResult

        self._step_flags = list(flags)
        call = self._pending
        assert call is not None and call.role == agent
        call.response = text
        self._answered.append(call.index)
        self.stats["calls"] += 1
        self._pending = None
        if call.future is not None and not call.future.done():
            call.future.set_result([GenResult([], text, [], "eos")])
        # what a trace needs of this call (transcripts, OpenTelemetry); not in info, which
        # must repeat exactly under the same seed (check_env), and latency does not
        self.last_trace = {"call": call.index, "role": call.role, "program_episode": self._ep.id if self._ep else None,
                           "latency_s": round(time.monotonic() - call.arrived, 6) if call.arrived else None}
        self._select()
        if agent in self.infos and not (self.terminations[agent] or self.truncations[agent]):
            self.infos[agent] = {"turn": 0, "flags": list(self._step_flags), "call": call.index}
        elif agent in self.infos:
            self.infos[agent]["call"] = call.index

    # ------------------------------------------------------------- fan-out
    def pending_calls(self) -> list[tuple[int, str]]:
        """``(call index, role)`` of every call awaiting an answer: the selected one first,
        then the others in arrival order (a fan-out's branches, answerable in one batch)."""
        out = [] if self._pending is None else [(self._pending.index, self._pending.role)]
        ep = self._ep
        if ep is not None:
            with ep.cond:
                out += [(c.index, c.role) for c in ep.pending]
        return out

    def select_call(self, index: int) -> str:
        """Make pending call ``index`` the agent selection (the call selected before goes
        back to the front of the queue); its role. The next ``step`` answers that call.

        Raises ``KeyError`` when call ``index`` is not pending (answered, or the episode ended).
        """
        if self._pending is not None and self._pending.index == index:
            return self._pending.role
        ep = self._ep
        if ep is None or not self.agents:
            raise KeyError(f"call {index} is not pending: the episode has ended")
        with ep.cond:
            match = next((c for c in ep.pending if c.index == index), None)
            if match is None:
                raise KeyError(f"call {index} is not pending (pending: {[c.index for c in ep.pending]})")
            ep.pending.remove(match)
            if self._pending is not None:
                ep.pending.insert(0, self._pending)
            self._pending = match
        self.agent_selection = match.role
        return match.role

    def messages(self, agent: str, inline_tools: bool | None = None) -> list[dict[str, Any]]:
        """The messages of ``agent``'s pending (else latest) call; with tools and unless
        ``inline_tools`` is False, the parser's tool instructions join the system message."""
        msgs = super().messages(agent)
        tools = self.tools(agent)
        if tools and inline_tools is not False:
            text = get_parser(self.parser).instructions(tools)
            if msgs and msgs[0]["role"] == "system":
                msgs[0] = {**msgs[0], "content": f"{msgs[0]['content']}\n\n{text}" if msgs[0]["content"] else text}
            else:
                msgs.insert(0, {"role": "system", "content": text})
        return msgs

    # ------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_ep"] = None
        state["_replay"] = self._ep is not None and not self._ep.ended and bool(self.agents)
        return state

    def _replay(self) -> None:
        """Restart the program and answer its calls from the record until it waits where the original did."""
        ep = _Episode(self)
        ep.replay = list(self.calls)
        self._ep = ep
        url = _HUB.url(ep)
        threading.Thread(target=_run_program, args=(self.program, url, self.problem, ep), daemon=True).start()
        selected = self._pending
        deadline = time.monotonic() + self.program_timeout_s
        with ep.cond:
            while ep.replay and not ep.replay_error and not ep.done and time.monotonic() < deadline:
                ep.cond.wait(max(0.0, deadline - time.monotonic()))
            if ep.replay or ep.replay_error:
                raise RuntimeError(f"the program is not deterministic: its replay did not repeat the recorded calls "
                                   f"({ep.replay_error or 'calls missing'}); derive everything from the problem and the replies")
            if selected is not None:
                ep.pending.remove(selected)

    def close(self) -> None:
        """End the running program's episode (its further calls are refused)."""
        self._end_program()

    def __repr__(self) -> str:
        return f"ProgramEnv({getattr(self.program, '__name__', 'program')}, roles={self.possible_agents})"


def _chat(base_url: str, role: str, content: str) -> str:
    """One chat completion over plain HTTP (``urllib``: the example needs no client package)."""
    body = json.dumps({"model": role, "messages": [{"role": "user", "content": content}]}).encode()
    req = urllib.request.Request(f"{base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"] or ""


def example_program(base_url: str, problem: Any) -> str:
    """``program-v0``'s default: solver -> checker over HTTP; the checker's reply is the answer."""
    draft = _chat(base_url, "solver", f"{problem.question}\nGive the final answer inside \\boxed{{}}.")
    return _chat(base_url, "checker", f"{problem.question}\nSolution: {draft}\nGive the final answer inside \\boxed{{}}.")


def make_program_env(program: Callable[..., Any] | str = "marft_envs.program_env:example_program",
                     roles: Sequence[str] = ("solver", "checker"), problems: Task | str | Sequence[Any] = "arith",
                     **kwargs: Any) -> ProgramEnv:
    """A :class:`ProgramEnv` running ``program(base_url, problem)`` with ``roles`` on ``problems``."""
    return ProgramEnv(program, roles, problems, **kwargs)


def _register() -> None:
    """``program-v0`` (``marft_envs.program_env:program-v0`` imports this module first):
    kwargs ``program`` ("module:function"), ``roles``, ``problems`` and the env options;
    by default :func:`example_program` (solver, checker) on arith."""
    if "program-v0" not in registry:
        register("program-v0", "marft_envs.program_env:make_program_env",
                 kwargs={"program": "marft_envs.program_env:example_program", "roles": ["solver", "checker"],
                         "problems": "arith", "split": "train"},
                 description="program(base_url, problem) through the OpenAI-compatible endpoint (docs/programs.md)")


_register()
