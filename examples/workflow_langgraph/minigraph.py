"""A LangGraph-style state graph in plain Python (no dependency): nodes, edges, a router.

The shape follows LangGraph's ``StateGraph``: ``add_node(name, fn)`` with ``async fn(state)
-> dict`` (a partial update merged into the state), ``add_edge(a, b)``,
``add_conditional_edges(a, router)`` with ``router(state) -> node name | END``, ``START``
and ``END``, then ``compile().ainvoke(state)``. Only what the example needs; a real
LangGraph graph has the same structure, but it runs on an asyncio event loop, which
marft's workflow driver does not provide (see docs/tutorial/existing-program.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

START, END = "__start__", "__end__"
Node = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class StateGraph:
    """Nodes and edges; ``compile()`` freezes them into a runnable graph."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.edges: dict[str, str] = {}
        self.routers: dict[str, Callable[[dict[str, Any]], str]] = {}

    def add_node(self, name: str, fn: Node) -> None:
        """Add node ``name`` running ``fn``."""
        if name in self.nodes or name in (START, END):
            raise ValueError(f"node {name!r} exists or is reserved")
        self.nodes[name] = fn

    def add_edge(self, source: str, target: str) -> None:
        """After ``source``, go to ``target``."""
        self.edges[source] = target

    def add_conditional_edges(self, source: str, router: Callable[[dict[str, Any]], str]) -> None:
        """After ``source``, go where ``router(state)`` says."""
        self.routers[source] = router

    def compile(self) -> CompiledGraph:
        """Check every edge names a node, and return the runnable graph."""
        for source, target in self.edges.items():
            for name in (source, target):
                if name not in self.nodes and name not in (START, END):
                    raise ValueError(f"edge {source!r} -> {target!r} names an unknown node {name!r}")
        return CompiledGraph(self)


class CompiledGraph:
    """A runnable graph: ``await graph.ainvoke(state)`` runs it from START to END."""

    def __init__(self, graph: StateGraph, max_steps: int = 25):
        self.graph = graph
        self.max_steps = max_steps

    async def ainvoke(self, state: dict[str, Any]) -> dict[str, Any]:
        """Run nodes from START, merging each node's update into ``state``, until END."""
        state = dict(state)
        node = self.graph.edges[START]
        for _ in range(self.max_steps):
            if node == END:
                return state
            state.update(await self.graph.nodes[node](state) or {})
            router = self.graph.routers.get(node)
            node = router(state) if router else self.graph.edges.get(node, END)
        raise RuntimeError(f"the graph did not reach END within {self.max_steps} steps")
