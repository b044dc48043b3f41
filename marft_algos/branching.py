"""Branching rollouts: at an agent's turn the env is copied and sibling actions are sampled.

With ``branching = b > 1`` (GRPO and MARFT configs; docs/credit.md) the collector plays a
tree per env copy instead of one episode. At an agent's turn (an action's first segment)
the path's env is deep-copied ``b - 1`` times (AEC envs copy exactly: the copies continue
from the same state, RNG included), ``b`` sibling actions are sampled from the one
observation, and each copy is stepped with its own action; the tree continues below every
sibling for the later agents. Every finished root-to-leaf path is one
:class:`~marft_algos.records.Episode`.

- ``branch_expand="all"``: the full tree (``G * b^depth`` leaves for G root copies of a
  problem): for small teams.
- ``branch_expand="random"``: a budgeted tree (MALT / PettingLLMs style): at each branch
  point one sibling, drawn at random, keeps branching; the others are played out as single
  chains, so each of them still gets a Monte-Carlo value. ``1 + (b - 1) * depth`` leaves per
  root copy.
- ``branch_depth = k > 0``: branch only at a path's first k actions.

All live paths of all trees generate in ONE batched ``policy.generate`` round (the b
siblings of a node are b identical requests, merged into one request with ``n = b`` by the
collector's prefix sharing), so branching costs tokens, never extra rounds per tree. Every
sampled token of every branch is recorded once (``rollout/tokens``). The actions above a
branch point are shared: the first child keeps them, its siblings carry
:attr:`~marft_algos.records.Transition.shadow` copies that complete their paths (returns,
transcripts) but are never counted, estimated or trained twice. Credited rewards on an
owned action are those of its owner's path (metrics only; the tree estimators read each
leaf's own path).

Trees are whole per group of G root copies, so DDP's split of groups over ranks
(:meth:`marft_algos.distributed.Distributed.collect`) never cuts a tree. A clone's episode
id is derived from its root's (``BRANCH_ID_BASE + root_id * LEAF_STRIDE + k``): unique,
and the same whichever rank plays the tree.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marft_algos.records import Episode

__all__ = ["BRANCH_EXPAND", "BRANCH_ID_BASE", "LEAF_STRIDE", "MAX_LEAVES", "run_tree_chunk", "tree_paths"]

#: how a tree grows: every sibling keeps branching, or one drawn at random
BRANCH_EXPAND = ("all", "random")
#: clone episode ids start here (root ids are the collector's running count, far below)
BRANCH_ID_BASE = 2**40
#: ids reserved per root copy for its clones
LEAF_STRIDE = 2**20
#: leaves one root copy may grow before the collector stops with an error
MAX_LEAVES = 4096


@dataclass
class _Path:
    """One live root-to-node path: its env copy, the episode it fills, where it stands."""

    env: Any
    ep: Episode
    order: tuple[int, ...]  # sorts the leaves depth-first (root position, child indices)
    tree: dict[str, Any]  # shared by every path of one root copy: clone counter, RNG
    steps: int = 0
    depth: int = 0  # actions taken on this path (tool continuations are the same action)
    expand: bool = True  # still branching (budgeted trees: the chosen sibling only)
    open_actions: dict[tuple[int, str], Any] = field(default_factory=dict)


def _clone(p: _Path, k: int) -> _Path:
    """Sibling ``k`` of ``p`` at a branch point: a deep copy of its env and episode (the
    episode's actions so far become shadows) under a fresh episode id."""
    try:
        env = copy.deepcopy(p.env)
    except Exception as e:  # noqa: BLE001 - any env that cannot copy itself
        raise TypeError(
            f"branching copies the env at each branch point, but {type(p.env).__name__} cannot be deep-copied "
            f"({type(e).__name__}: {e}); use branching=1 with this env, or make it copyable (__deepcopy__)"
        ) from e
    tree = p.tree
    tree["clones"] += 1
    if tree["clones"] >= min(LEAF_STRIDE, MAX_LEAVES):
        raise RuntimeError(
            f"a branching tree grew past {MAX_LEAVES} leaves from one root copy: lower branching, set branch_depth "
            "(branch only at the first actions) or branch_expand='random' (a budgeted tree)"
        )
    ep = copy.deepcopy(p.ep)
    ep.episode_id = BRANCH_ID_BASE + tree["root_id"] * LEAF_STRIDE + tree["clones"]
    for t in ep.transitions:
        t.shadow = True
    return _Path(env=env, ep=ep, order=p.order + (k,), tree=tree, steps=p.steps, depth=p.depth, expand=p.expand,
                 open_actions=copy.deepcopy(p.open_actions))


def run_tree_chunk(col: Any, chunk: Sequence[dict[str, Any]], counters: dict[str, float]) -> list[Episode]:
    """Play one tree per reset spec of ``chunk`` with collector ``col`` (round-based, every
    path's request in one generation round); the leaves' episodes, depth-first per root."""
    # deferred: marft_algos.models loads the model stack (transformers)
    from marft_algos.models import GenRequest

    roots = col._reset_chunk(chunk)
    live: list[_Path] = []
    for i, (ep, spec) in enumerate(zip(roots, chunk, strict=True)):
        seed = spec.get("seed")
        # the budgeted tree's draws: one stream per root copy, the same on any rank
        rng = np.random.default_rng([abs(int(seed)) if seed is not None else 0, int(ep.group_id), int(ep.episode_id)])
        live.append(_Path(env=col.envs[i], ep=ep, order=(i,), tree={"clones": 0, "root_id": ep.episode_id, "rng": rng}))
    finished: list[_Path] = []
    while live:
        requests: list[Any] = []
        owners: list[tuple[_Path, str, list[int], float, Any, int]] = []
        overlong: list[tuple[_Path, str, list[int], Any]] = []
        still: list[_Path] = []
        for p in live:
            agent = col._advance_to_live_agent(p.env, p.ep, counters)
            if agent is None or p.steps >= col.max_steps_per_episode:
                col._finish(p.env, p.ep)
                finished.append(p)
                continue
            still.append(p)
            if len(col._round_calls(p.env, agent)) > 1:
                raise NotImplementedError(
                    "branching does not follow a program env's parallel calls (fan-out): use branching=1 with this env"
                )
            opened = p.open_actions.get((0, agent))
            role, prompt_ids, tools, sampling = col._request_parts(p.env, agent, opened, counters)
            if sampling is None:
                overlong.append((p, agent, prompt_ids, tools))
                continue
            branch = opened is None and p.expand and (col.branch_depth == 0 or p.depth < col.branch_depth)
            width = col.branching if branch else 1
            requests += [GenRequest(role=role, prompt_ids=prompt_ids, sampling=sampling) for _ in range(width)]
            owners.append((p, agent, prompt_ids, col.sampled_temperature(sampling), tools, width))
        live = still
        results = col._generate(requests, counters) if requests else []
        jobs: list[tuple[_Path, str, list[int], Any, float, Any, bool]] = [
            (p, agent, ids, None, 1.0, tools, True) for p, agent, ids, tools in overlong
        ]
        pos = 0
        for p, agent, ids, temp, tools, width in owners:
            kids = [p] + [_clone(p, k) for k in range(1, width)]  # every copy before any step
            if width > 1:
                counters["rollout/branch_points"] += 1
                counters["rollout/branch_clones"] += width - 1
                chosen = int(p.tree["rng"].integers(width)) if col.branch_expand == "random" else -1
                for k, kid in enumerate(kids):
                    kid.expand = chosen < 0 or k == chosen
                p.order = p.order + (0,)
                live += kids[1:]
            new_action = p.open_actions.get((0, agent)) is None
            jobs += [(kid, agent, ids, r, temp, tools, new_action) for kid, r in zip(kids, results[pos : pos + width], strict=True)]
            pos += width
        if not jobs:
            continue
        stepped = col._step_envs([(p.env, agent, col.action_text(r), None) for p, agent, _, r, _, _, _ in jobs])
        for (p, agent, ids, r, temp, tools, new_action), outcome in zip(jobs, stepped, strict=True):
            col._record_step(p.ep, (0, agent), ids, r, outcome, counters, temp, p.open_actions, tools)
            p.steps += 1
            p.depth += int(new_action)
    finished.sort(key=lambda p: p.order)
    counters["rollout/tree_leaves"] += len(finished)
    return [p.ep for p in finished]


def tree_paths(episodes: Sequence[Episode]) -> list[list[tuple[Any, Any]]]:
    """Each episode's path as ``(node, action)`` pairs for :func:`marft_algos.credit.tree_credit`.

    An action is its :attr:`~marft_algos.records.Transition.action_key` (an owner and its
    shadows share it; tool segments of one action too); its node is the previous action on
    the path, or ``(group_id, None)`` at the root: the G root copies of a group reset to one
    state, so all their first actions are siblings.
    """
    out = []
    for ep in episodes:
        path: list[tuple[Any, Any]] = []
        node: Any = (ep.group_id, None)
        for t in ep.transitions:
            key = t.action_key
            if path and path[-1][1] == key:
                continue  # a later segment of the same action
            path.append((node, key))
            node = key
        out.append(path)
    return out
