"""Team topologies: the Flex-POMDP dependency function D, made explicit.

In MARFT's Flex-POMDP an agent acts after, and conditions on, the actions of
the agents it depends on. A topology is that function as an object:

- ``dependency(a_i, a_j)``: can ``a_j`` depend on ``a_i`` (does ``a_j`` see ``a_i``'s action)?
- ``parents(agent, executed)``: whose actions of the current turn ``agent`` sees,
  given the ``(agent, action)`` pairs executed so far in the turn.
- ``next_agent(executed)``: who acts next (``None``: the turn is complete). The
  environment calls it after every action, so a topology may depend on what was
  said (:class:`Routed`), not only on who spoke.
- ``graph()``: adjacency ``{agent: [agents that depend on it]}``;
  ``topological_order()``: an order in which every agent follows its parents.

Static topologies (:class:`Chain`, :class:`DAG`, :class:`Independent`) are DAGs
and acting order is their topological order (ties broken by declaration
order). :class:`Independent` has no edges: a plain Dec-POMDP turn order where
no agent sees another's action. :class:`Routed` is dynamic: the orchestrator's
text names the specialist that acts next. :class:`MultiHopRouted` lets control come
back: after each specialist the orchestrator acts again and routes to another
specialist or finishes, within a hop budget (agents may then act several times
in one turn; D changes per hop).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Topology",
    "DAG",
    "Chain",
    "Independent",
    "MultiHopRouted",
    "Routed",
    "RouteDecision",
    "SeeAll",
    "TopologyError",
    "topology_from_dict",
]

Executed = Sequence[tuple[str, str]]


class TopologyError(ValueError):
    """An invalid topology (a cycle, an unknown agent, a duplicate name)."""


class Topology:
    """Base class. Subclasses define :meth:`next_agent`, :meth:`parents` and :meth:`dependency`."""

    agents: tuple[str, ...]
    #: True when the acting order does not depend on what agents say.
    is_static: bool = True
    #: True when an agent may act more than once in a turn (:class:`MultiHopRouted`).
    repeats: bool = False
    #: True when every agent sees every action of the earlier turns (not only its own and
    #: its parents'): a dialogue history, as in ReMA's multi-turn meta-thinker/reasoner.
    shared_history: bool = False

    def visible_history(self, agent: str, past: Executed) -> list[tuple[str, str]]:
        """The pairs of an earlier turn ``past`` that ``agent`` sees: all of them with
        ``shared_history``, else its own and its parents' (the default)."""
        if self.shared_history:
            return list(past)
        parents = set(self.parents(agent, past))
        return [(a, x) for a, x in past if a == agent or a in parents]

    @property
    def max_actions_per_turn(self) -> int:
        """The most actions a turn can have (sizes the observation space)."""
        return len(self.agents)

    def visible_actions(self, agent: str, executed: Executed) -> list[tuple[str, str]]:
        """The ``(agent, action)`` pairs of this turn that ``agent`` sees, in the order shown.

        Default: the latest action of each parent, in parent order (what every static
        topology and :class:`Routed` show)."""
        acted = dict(executed)
        return [(p, acted[p]) for p in self.parents(agent, executed) if p in acted]

    def view_note(self, agent: str, executed: Executed) -> str | None:
        """An extra line for ``agent``'s view (e.g. "the hop budget is spent"); None by default."""
        return None

    def turn_info(self, executed: Executed) -> dict[str, Any]:
        """Extra ``info`` keys for a completed turn (routes, hop counts); empty by default."""
        return {}

    def next_agent(self, executed: Executed) -> str | None:
        """Who acts next given this turn's ``(agent, action)`` pairs; None ends the turn."""
        raise NotImplementedError

    def parents(self, agent: str, executed: Executed = ()) -> list[str]:
        """Agents whose actions of this turn ``agent`` sees, given what was executed."""
        raise NotImplementedError

    def dependency(self, a_i: str, a_j: str) -> bool:
        """Whether ``a_j`` may depend on (see the action of) ``a_i``: an edge of D."""
        raise NotImplementedError

    def graph(self) -> dict[str, list[str]]:
        """Adjacency ``{agent: [agents that may depend on it]}`` (edges of D)."""
        return {a: [b for b in self.agents if self.dependency(a, b)] for a in self.agents}

    def topological_order(self) -> list[str]:
        """An order in which every agent comes after the agents it depends on."""
        raise NotImplementedError

    def step_flags(self, executed: Executed) -> list[str]:
        """Flags raised by the last executed action (e.g. ``"route_unparsed"``)."""
        return []

    def to_dict(self) -> dict[str, Any]:
        """JSON form, as used in profile files (inverse: :func:`topology_from_dict`)."""
        raise NotImplementedError

    def _check_agent(self, agent: str) -> None:
        if agent not in self.agents:
            raise KeyError(f"unknown agent {agent!r}; agents are {list(self.agents)}")


class SeeAll(Topology):
    """Base of the topologies in which any agent may see any other's action: who acts,
    and so who is seen, is decided at run time (a multi-hop router, a workflow program)."""

    is_static = False
    repeats = True

    def parents(self, agent: str, executed: Executed = ()) -> list[str]:
        """Everyone else (statically); of ``executed``, every other agent that acted, in
        first-action order."""
        self._check_agent(agent)
        if not executed:
            return [a for a in self.agents if a != agent]
        return list(dict.fromkeys(a for a, _ in executed if a != agent))

    def dependency(self, a_i: str, a_j: str) -> bool:
        """Any agent may see any other's action."""
        self._check_agent(a_i)
        self._check_agent(a_j)
        return a_i != a_j

    def topological_order(self) -> list[str]:
        """Declaration order (D is decided at run time)."""
        return list(self.agents)


def _routed_dict(kind: str, fields: dict[str, Any], route_pattern: str, route_format: str) -> dict[str, Any]:
    """The JSON form of a routed topology: ``route_pattern`` and ``route_format`` only when not the defaults."""
    d: dict[str, Any] = {"type": kind, **fields}
    if route_pattern != Routed.DEFAULT_PATTERN:
        d["route_pattern"] = route_pattern
    if route_format != Routed.DEFAULT_FORMAT:
        d["route_format"] = route_format
    return d


def _check_route_format(route_format: str) -> None:
    try:  # exactly one "{}" and no other field ("{{" writes a brace)
        ok = isinstance(route_format, str) and route_format.format("\0").count("\0") == 1 and route_format.count("{}") == 1
    except (IndexError, KeyError, ValueError):
        ok = False
    if not ok:
        raise TopologyError(f"route_format must be a string with one '{{}}' for the target, got {route_format!r}")


def _unique(names: Iterable[str], what: str) -> tuple[str, ...]:
    names = tuple(names)
    for n in names:
        if not isinstance(n, str) or not n:
            raise TopologyError(f"{what} names must be non-empty strings, got {n!r}")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TopologyError(f"duplicate {what} names: {dupes}")
    return names


class DAG(Topology):
    """A static directed acyclic graph ``{agent: [parents]}``.

    An agent acts once its parents have acted and sees only its direct parents'
    actions. Agents act in topological order, ties broken by the mapping's
    order, so parallel branches (``{"solver_a": [], "solver_b": [],
    "aggregator": ["solver_a", "solver_b"]}``) act one after the other without
    seeing each other.

    Raises:
        TopologyError: on a cycle (the message names it), a self-dependency or
            an unknown parent.
    """

    def __init__(self, parents: Mapping[str, Sequence[str]]):
        self.agents = _unique(parents, "agent")
        if not self.agents:
            raise TopologyError("a topology needs at least one agent")
        self._parents: dict[str, tuple[str, ...]] = {}
        for agent, ps in parents.items():
            if isinstance(ps, str):
                ps = [ps]
            ps = _unique(ps or (), f"parent of {agent!r}")
            for p in ps:
                if p == agent:
                    raise TopologyError(f"agent {agent!r} cannot depend on itself")
                if p not in parents:
                    raise TopologyError(
                        f"agent {agent!r} depends on unknown agent {p!r}; agents are {list(self.agents)}"
                    )
            self._parents[agent] = ps
        self._order = self._toposort()

    def _toposort(self) -> list[str]:
        # Kahn's algorithm; picking the earliest declared ready agent keeps the order stable.
        done: list[str] = []
        remaining = list(self.agents)
        while remaining:
            ready = [a for a in remaining if all(p in done for p in self._parents[a])]
            if not ready:
                raise TopologyError(f"dependency cycle: {' -> '.join(self._find_cycle(remaining))}")
            done.append(ready[0])
            remaining.remove(ready[0])
        return done

    def _find_cycle(self, nodes: list[str]) -> list[str]:
        # Every remaining node has a remaining parent: walk parents until a repeat.
        path = [nodes[0]]
        while True:
            nxt = next(p for p in self._parents[path[-1]] if p in nodes)
            if nxt in path:
                cycle = path[path.index(nxt):] + [nxt]
                return list(reversed(cycle))
            path.append(nxt)

    def next_agent(self, executed: Executed) -> str | None:
        """The first agent in topological order that has not acted this turn."""
        acted = {a for a, _ in executed}
        for agent in self._order:
            if agent not in acted:
                return agent
        return None

    def parents(self, agent: str, executed: Executed = ()) -> list[str]:
        """Direct parents of ``agent`` that acted in ``executed``, in execution order.

        With ``executed`` empty (the default) this is the static parent list.
        """
        self._check_agent(agent)
        if not executed:
            return list(self._parents[agent])
        ps = set(self._parents[agent])
        return [a for a, _ in executed if a in ps]

    def dependency(self, a_i: str, a_j: str) -> bool:
        """True when ``a_i`` is a direct parent of ``a_j``."""
        self._check_agent(a_i)
        self._check_agent(a_j)
        return a_i in self._parents[a_j]

    def topological_order(self) -> list[str]:
        """Kahn's order, ties broken by declaration order."""
        return list(self._order)

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "dag", "parents": {...}}``."""
        return {"type": "dag", "parents": {a: list(ps) for a, ps in self._parents.items()}}

    def __repr__(self) -> str:
        return f"DAG({ {a: list(ps) for a, ps in self._parents.items()} })"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]


class Chain(DAG):
    """Agents act in list order, each seeing the actions of all earlier agents.

    This is the reference implementation's semantics (agent ``i`` sees agents
    ``0..i-1``). With ``full=False`` each agent sees only its predecessor.
    """

    def __init__(self, agents: Sequence[str], *, full: bool = True, shared_history: bool = False):
        agents = _unique(agents, "agent")
        self.full = full
        self.shared_history = bool(shared_history)
        super().__init__(
            {a: (list(agents[:i]) if full else list(agents[max(0, i - 1):i])) for i, a in enumerate(agents)}
        )

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "chain", "agents": [...], "full": ...}`` (more compact than the DAG form;
        ``"shared_history": true`` only when set)."""
        d: dict[str, Any] = {"type": "chain", "agents": list(self.agents), "full": self.full}
        if self.shared_history:
            d["shared_history"] = True
        return d

    def __repr__(self) -> str:
        return (f"Chain({list(self.agents)}{'' if self.full else ', full=False'}"
                f"{', shared_history=True' if self.shared_history else ''})")


class Independent(DAG):
    """No dependencies: agents act in list order and see no other agent's action (a Dec-POMDP)."""

    def __init__(self, agents: Sequence[str]):
        super().__init__({a: [] for a in _unique(agents, "agent")})

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "independent", "agents": [...]}``."""
        return {"type": "independent", "agents": list(self.agents)}

    def __repr__(self) -> str:
        return f"Independent({list(self.agents)})"


@dataclass(frozen=True)
class RouteDecision:
    """How an orchestrator's text was routed.

    ``status`` is ``"ok"`` (a route line named a specialist), ``"mention"`` (no
    usable route line, but exactly one specialist was named as a word) or
    ``"unparsed"`` (the fallback ``target`` was used). ``line_unparsed`` is True
    when an explicit route line was there but named no specialist (so a
    ``"mention"`` after it is a fallback, not what the line said).
    """

    target: str
    status: str
    raw: str | None = None
    line_unparsed: bool = field(default=False, repr=False)  # repr kept as documented

    @property
    def parsed(self) -> bool:
        """True when a specialist was identified (route line or a single mention)."""
        return self.status != "unparsed"

    @property
    def flags(self) -> list[str]:
        """Env flags for this decision: ``route_unparsed`` when the route line (or the
        whole reply) could not be read, ``route_by_mention`` when a mention decided."""
        out = ["route_unparsed"] if self.status == "unparsed" or self.line_unparsed else []
        return out + (["route_by_mention"] if self.status == "mention" else [])


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "", name.lower())


def _check_route_line(topology: Any, line: str, target: str, parses: bool) -> None:
    """Raise when a scripted route line does not route to ``target`` under the topology's pattern."""
    if not parses:
        raise TopologyError(
            f"the route line {line!r} (route_format {topology.route_format!r}) does not parse to {target!r} "
            f"under route_pattern {topology.route_pattern!r}; pass a route_format your pattern reads"
        )


class Routed(Topology):
    """An orchestrator whose reply names the specialist that acts next.

    Turn: ``orchestrator`` -> one of ``specialists`` -> ``finisher`` (if any).
    The specialist sees the orchestrator's action; the finisher sees both.

    Parsing is tolerant: the last match of ``route_pattern`` (default
    ``ROUTE: <name>``, case-insensitive, markdown and punctuation ignored) is
    compared with the specialist names ignoring case, spaces, ``_`` and ``-``,
    then by prefix and close spelling. Without a usable route line, a reply that
    names exactly one specialist routes there, flagged ``"route_by_mention"``
    (and ``"route_unparsed"`` too if a route line was there but unreadable, as in
    ``"ROUTE: nonsense ... geometry"``). Anything else is *unparsed*: the turn
    goes to ``default`` (the first specialist unless given), and the
    environment flags ``"route_unparsed"`` in ``info``, counts it and logs it.

    ``route_format`` is how a scripted orchestrator writes a route (the SFT
    demonstrations of ``TextTeamEnv.demo_action``), ``"ROUTE: {}"`` by default; with a
    custom ``route_pattern``, give the format your pattern reads.
    """

    is_static = False
    # One character-class run between "route" and the name keeps matching linear.
    DEFAULT_PATTERN = r"\broute(?:\s+to\b)?[\s:=\-*_`\"'\[(<]*([A-Za-z][\w \-]{0,40})"
    DEFAULT_FORMAT = "ROUTE: {}"

    def __init__(
        self,
        orchestrator: str,
        specialists: Sequence[str],
        finisher: str | None = None,
        *,
        route_pattern: str = DEFAULT_PATTERN,
        default: str | None = None,
        route_format: str = DEFAULT_FORMAT,
    ):
        specialists = _unique(specialists, "specialist")
        if not specialists:
            raise TopologyError("Routed needs at least one specialist")
        names = [orchestrator, *specialists] + ([finisher] if finisher else [])
        self.agents = _unique(names, "agent")
        self.orchestrator = orchestrator
        self.specialists = specialists
        self.finisher = finisher
        self.route_pattern = route_pattern
        self._route_re = re.compile(route_pattern, re.IGNORECASE)
        _check_route_format(route_format)
        self.route_format = route_format
        if default is not None and default not in specialists:
            raise TopologyError(f"default route {default!r} is not a specialist {list(specialists)}")
        self.default = default or specialists[0]
        self._by_norm = {_norm(s): s for s in specialists}

    def route(self, text: str) -> RouteDecision:
        """Parse the orchestrator's ``text`` into a :class:`RouteDecision` (pure, never raises)."""
        if not isinstance(text, str):
            return RouteDecision(self.default, "unparsed")
        text = text[-20_000:]  # routes come last; bound the regex work
        matches = self._route_re.findall(text)
        for raw in reversed(matches):
            raw = raw if isinstance(raw, str) else raw[0]
            target = self._resolve(raw)
            if target is not None:
                return RouteDecision(target, "ok", raw.strip())
        words = {_norm(w) for w in re.findall(r"[A-Za-z][\w\-]*", text)}
        named = [s for n, s in self._by_norm.items() if n in words]
        line = bool(matches)  # a route line was there, but named no specialist
        if len(named) == 1:
            return RouteDecision(named[0], "mention", named[0], line_unparsed=line)
        raw = matches[-1].strip() if matches and isinstance(matches[-1], str) else None
        return RouteDecision(self.default, "unparsed", raw, line_unparsed=line)

    def _resolve(self, raw: str) -> str | None:
        norm = _norm(raw)
        if not norm:
            return None
        if norm in self._by_norm:
            return self._by_norm[norm]
        # "algebra specialist", "number theory." -> the longest name the text starts with
        starts = [n for n in self._by_norm if norm.startswith(n)]
        if starts:
            return self._by_norm[max(starts, key=len)]
        first = _norm(raw.split()[0]) if raw.split() else norm
        close = difflib.get_close_matches(first, list(self._by_norm), n=1, cutoff=0.8)
        return self._by_norm[close[0]] if close else None

    def demo_route(self, agent: str, executed: Executed) -> str | None:
        """Where a scripted orchestrator routes (SFT demonstrations): the default specialist;
        None for any other agent."""
        return self.default if agent == self.orchestrator else None

    def route_line(self, target: str) -> str:
        """The line a scripted orchestrator writes to route to ``target`` (``route_format``),
        checked to parse back to it: a custom ``route_pattern`` needs its own ``route_format``."""
        line = self.route_format.format(target)
        decision = self.route(line)
        _check_route_line(self, line, target, (decision.target, decision.status) == (target, "ok"))
        return line

    def next_agent(self, executed: Executed) -> str | None:
        """Orchestrator, then the routed specialist (parsed from its text), then the finisher."""
        if not executed:
            return self.orchestrator
        if len(executed) == 1:
            return self.route(executed[0][1]).target
        if len(executed) == 2 and self.finisher:
            return self.finisher
        return None

    def step_flags(self, executed: Executed) -> list[str]:
        """``route_unparsed`` / ``route_by_mention`` for the orchestrator's action
        (see :attr:`RouteDecision.flags`)."""
        if len(executed) == 1 and executed[0][0] == self.orchestrator:
            return self.route(executed[0][1]).flags
        return []

    def parents(self, agent: str, executed: Executed = ()) -> list[str]:
        """The orchestrator for a specialist; everyone who acted for the finisher."""
        self._check_agent(agent)
        if not executed:
            if agent == self.orchestrator:
                return []
            if agent == self.finisher:
                return [self.orchestrator, *self.specialists]
            return [self.orchestrator]
        return [a for a, _ in executed if a != agent and self.dependency(a, agent)]

    def dependency(self, a_i: str, a_j: str) -> bool:
        """Specialists see only the orchestrator; the finisher sees everyone; nobody
        feeds the orchestrator."""
        self._check_agent(a_i)
        self._check_agent(a_j)
        if a_j == self.orchestrator or a_i == a_j:
            return False
        if a_j == self.finisher:
            return True
        return a_i == self.orchestrator  # a specialist sees only the orchestrator

    def topological_order(self) -> list[str]:
        """A valid order of the possible-dependency graph; a turn visits a subset of it."""
        return list(self.agents)

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "routed", ...}`` (``route_pattern`` and ``route_format`` only when not the defaults)."""
        fields = {"orchestrator": self.orchestrator, "specialists": list(self.specialists),
                  "finisher": self.finisher, "default": self.default}
        return _routed_dict("routed", fields, self.route_pattern, self.route_format)

    def __repr__(self) -> str:
        return (
            f"Routed({self.orchestrator!r}, {list(self.specialists)}, finisher={self.finisher!r}, "
            f"default={self.default!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Routed) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


class MultiHopRouted(SeeAll):
    """An orchestrator that routes to specialists one hop at a time and gets control back.

    Turn: ``orchestrator`` -> specialist -> ``orchestrator`` -> specialist -> ... ->
    ``orchestrator``. Each orchestrator reply either routes (``ROUTE: <name>``, read like
    :class:`Routed` reads it, but only from an explicit route line, never from a mere
    mention) or finishes: ``ROUTE: done`` (also ``finish``, ``end``, ``none``, ``answer``)
    or a reply with no route line at all. The orchestrator's last reply is the team's
    answer, so give it ``with_answer`` in the profile.

    Hop budget: at most ``max_hops`` specialist actions per turn. Once it is spent the
    orchestrator acts one last time (its view says so) and the turn ends whatever it
    writes; a route in that reply is flagged ``hop_budget_exhausted``. A route line that
    names neither a specialist nor a finish word is flagged ``route_unparsed`` and ends
    the turn too (that reply is graded): an unreadable route is the orchestrator's
    mistake, never a silent detour. A turn has at most ``2 * max_hops + 1`` actions.

    D per hop: a specialist sees every action of the turn so far (the orchestrator's
    instructions and earlier specialists' work); the orchestrator sees all of them,
    its own earlier routes included. ``turn_info`` reports ``routes`` (each
    orchestrator decision: a specialist or ``"done"``), ``hops``, ``route_counts`` (per
    specialist) and ``handoff_loops`` (control passed back and forth between the same
    two agents more than twice in a row).
    """

    FINISH_WORDS = ("done", "finish", "finished", "end", "none", "answer", "final", "stop")
    DONE = "done"

    def __init__(
        self,
        orchestrator: str,
        specialists: Sequence[str],
        *,
        max_hops: int = 3,
        route_pattern: str = Routed.DEFAULT_PATTERN,
        route_format: str = Routed.DEFAULT_FORMAT,
    ):
        specialists = _unique(specialists, "specialist")
        if not specialists:
            raise TopologyError("MultiHopRouted needs at least one specialist")
        if isinstance(max_hops, bool) or not isinstance(max_hops, int) or max_hops < 1:
            raise TopologyError(f"max_hops must be an integer >= 1, got {max_hops!r}")
        self.agents = _unique([orchestrator, *specialists], "agent")
        self.orchestrator = orchestrator
        self.specialists = specialists
        self.max_hops = int(max_hops)
        self.route_pattern = route_pattern
        clash = [s for s in specialists if _norm(s) in self.FINISH_WORDS]
        if clash:
            raise TopologyError(f"specialist names {clash} are finish words {list(self.FINISH_WORDS)}; rename them")
        # The one-hop parser, reused for its route-line reading (mentions are ignored here).
        self._router = Routed(orchestrator, specialists, route_pattern=route_pattern, route_format=route_format)
        self.route_format = route_format

    @property
    def max_actions_per_turn(self) -> int:
        """``2 * max_hops + 1``: every hop is a specialist plus the orchestrator after it."""
        return 2 * self.max_hops + 1

    def decide(self, text: str) -> tuple[str, list[str]]:
        """``(target, flags)`` for an orchestrator reply: a specialist, or ``"done"``.

        Pure and never raises; ``flags`` is ``["route_unparsed"]`` when a route line named
        neither a specialist nor a finish word."""
        if not isinstance(text, str):
            return self.DONE, []
        tail = text[-20_000:]
        matches = self._router._route_re.findall(tail)
        if not matches:
            return self.DONE, []  # no route line: the reply is the answer
        raw = matches[-1] if isinstance(matches[-1], str) else matches[-1][0]
        words = raw.split()
        if words and _norm(words[0]) in self.FINISH_WORDS:
            return self.DONE, []
        target = self._router._resolve(raw)
        if target is None:
            return self.DONE, ["route_unparsed"]
        return target, []

    def _hops(self, executed: Executed) -> int:
        return sum(1 for a, _ in executed if a != self.orchestrator)

    def demo_route(self, agent: str, executed: Executed) -> str | None:
        """Where a scripted orchestrator routes (SFT demonstrations): each specialist not yet
        asked this turn, in order, while hops are left, then ``"done"`` (it answers); None for
        any other agent."""
        if agent != self.orchestrator:
            return None
        asked = {a for a, _ in executed}
        pending = [s for s in self.specialists if s not in asked]
        return pending[0] if pending and self._hops(executed) < self.max_hops else self.DONE

    def route_line(self, target: str) -> str:
        """The line a scripted orchestrator writes to route to ``target`` or to finish
        (``"done"``), checked to parse back to it (see :meth:`Routed.route_line`)."""
        line = self.route_format.format(target)
        _check_route_line(self, line, target, self.decide(line) == (target, []))
        return line

    def next_agent(self, executed: Executed) -> str | None:
        """Orchestrator first and after every specialist; a specialist when it routes and
        hops are left; None when it finishes, misroutes or the budget is spent."""
        if not executed:
            return self.orchestrator
        last_agent, last_text = executed[-1]
        if last_agent != self.orchestrator:
            return self.orchestrator
        if self._hops(executed) >= self.max_hops:
            return None
        target, _ = self.decide(last_text)
        return None if target == self.DONE else target

    def step_flags(self, executed: Executed) -> list[str]:
        """``route_unparsed`` for an unreadable route line; ``hop_budget_exhausted`` for a
        route written after the budget was spent."""
        if not executed or executed[-1][0] != self.orchestrator:
            return []
        target, flags = self.decide(executed[-1][1])
        if target != self.DONE and self._hops(executed) >= self.max_hops:
            return ["hop_budget_exhausted"]
        return flags

    def visible_actions(self, agent: str, executed: Executed) -> list[tuple[str, str]]:
        """The whole turn so far, in order (the agent's own earlier actions included)."""
        self._check_agent(agent)
        return [(a, x) for a, x in executed]

    def view_note(self, agent: str, executed: Executed) -> str | None:
        """The orchestrator's view says how many hops are left (and when none are)."""
        if agent != self.orchestrator:
            return None
        left = self.max_hops - self._hops(executed)
        if left <= 0:
            return "No routing hops are left: give the final answer now."
        return f"Routing hops left: {left}."

    def turn_info(self, executed: Executed) -> dict[str, Any]:
        """``routes``, ``hops``, ``route_counts`` and ``handoff_loops`` of a turn."""
        routes: list[str] = []
        for k, (a, _) in enumerate(executed):
            if a == self.orchestrator and k + 1 < len(executed):
                routes.append(executed[k + 1][0])
            elif a == self.orchestrator:
                routes.append(self.DONE)
        counts = dict.fromkeys(self.specialists, 0)
        for a, _ in executed:
            if a in counts:
                counts[a] += 1
        loops, run, prev_pair = 0, 0, None
        actors = [a for a, _ in executed]
        for k in range(1, len(actors)):
            if actors[k] == actors[k - 1]:
                continue
            pair = frozenset(actors[k - 1 : k + 1])
            run = run + 1 if pair == prev_pair else 1
            prev_pair = pair
            if run > 2:
                loops += 1
        return {"routes": routes, "hops": self._hops(executed), "route_counts": counts, "handoff_loops": loops}

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "multihop", ...}`` (``route_pattern`` and ``route_format`` only when not the defaults)."""
        fields = {"orchestrator": self.orchestrator, "specialists": list(self.specialists), "max_hops": self.max_hops}
        return _routed_dict("multihop", fields, self.route_pattern, self.route_format)

    def __repr__(self) -> str:
        return f"MultiHopRouted({self.orchestrator!r}, {list(self.specialists)}, max_hops={self.max_hops})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MultiHopRouted) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


def topology_from_dict(d: Mapping[str, Any]) -> Topology:
    """Inverse of ``Topology.to_dict()`` (the JSON form used in profile files)."""
    d = dict(d)
    kind = str(d.pop("type", "")).lower()
    try:
        if kind == "chain":
            return Chain(d["agents"], full=d.get("full", True), shared_history=d.get("shared_history", False))
        if kind == "independent":
            return Independent(d["agents"])
        if kind == "dag":
            return DAG(d["parents"])
        if kind == "routed":
            return Routed(
                d["orchestrator"],
                d["specialists"],
                d.get("finisher"),
                route_pattern=d.get("route_pattern", Routed.DEFAULT_PATTERN),
                default=d.get("default"),
                route_format=d.get("route_format", Routed.DEFAULT_FORMAT),
            )
        if kind == "multihop":
            return MultiHopRouted(
                d["orchestrator"],
                d["specialists"],
                max_hops=d.get("max_hops", 3),
                route_pattern=d.get("route_pattern", Routed.DEFAULT_PATTERN),
                route_format=d.get("route_format", Routed.DEFAULT_FORMAT),
            )
    except KeyError as e:
        raise TopologyError(f"topology of type {kind!r} is missing the field {e}") from None
    raise TopologyError(f"unknown topology type {kind!r}; expected chain, dag, independent, routed or multihop")
